"""``python -m leasekit``: the ``leasekit`` command line."""

from leasekit.cli import main

if __name__ == "__main__":
    main()
