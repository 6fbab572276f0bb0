import sys

try:
    from remote_ops.cli import main
except KeyboardInterrupt:          # Ctrl-C while Python was still loading the program
    sys.stderr.write("remote-ops: interrupted before anything changed\n")
    sys.exit(130)

sys.exit(main())
