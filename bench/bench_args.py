"""bench_args.py: argparse pieces the PyTorch sides of the benchmarks share
(bench/mlp_step_torch.py, bench/ddp_step_torch.py). They run as scripts, so this
module is found beside them on sys.path."""
import argparse


def at_least(low):
    """An argparse type: an integer >= low (a count of zero steps would time nothing)."""
    def parse(text):
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is less than {low}")
        return value
    parse.__name__ = f"integer >= {low}"  # argparse names the type in its error
    return parse
