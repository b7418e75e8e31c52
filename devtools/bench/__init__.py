"""`make bench`: see devtools/bench/cli.py for the parts and options."""
