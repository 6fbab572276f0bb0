"""Timings and memory on this machine: the controller against Ansible and ssh, scale, the job's CPU side."""
