"""A training loop in plain Python, marked for zerotrace (the README's example).

    zt probe -o loop.db -- python3 examples/train_loop.py
    zt probe -o leak.db -- python3 examples/train_loop.py --epochs 4 --leak
    zt check leak.db --leaks          # FAIL: names the line that keeps the memory

Each step allocates 2 MiB of "activations" and frees them; with --leak each epoch also keeps
a 4 MiB buffer that nothing frees. Standard library only. `import zerotrace` works under
`zt probe`, which puts the package on PYTHONPATH; elsewhere add `zt probe --python-path` to it.
"""

import argparse

import zerotrace


def train_step(batch):
    activations = bytearray(2 << 20)  # 2 MiB: at least zt probe's 1 MiB threshold, so recorded
    return sum(batch) / len(batch) + len(activations) * 0.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4, help="steps per epoch")
    parser.add_argument("--leak", action="store_true", help="keep 4 MiB more every epoch")
    args = parser.parse_args()

    kept = []
    for e in range(args.epochs):
        with zerotrace.epoch(e):
            for s in range(args.steps):
                with zerotrace.step(e * args.steps + s):
                    with zerotrace.phase("forward"):
                        loss = train_step(range(s + 1, s + 100))
            if args.leak:
                kept.append(bytearray(4 << 20))  # the leak: a cache nothing clears
        print(f"epoch {e}: loss {loss:.2f}")


if __name__ == "__main__":
    main()
