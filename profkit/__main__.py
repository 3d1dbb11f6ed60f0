"""`python -m profkit`: the same command line as `profkit`."""

from profkit.cli import main

if __name__ == "__main__":
    main()
