"""GPU harnesses: run on a lent GPU machine through remote-ops itself (session.sh, plans/); lib/ is what they share."""
