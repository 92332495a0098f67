"""argparse types shared by the scripts (reproduce.py, calibrate_gnmr.py, bench_pytorch.py)."""
import argparse


def whole_number(minimum, hint=""):
    """An argparse type: a whole number of at least `minimum`; `hint` ends the error message."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"expected a whole number of at least {minimum}, got {text!r}{hint}")
        return value
    return parse
