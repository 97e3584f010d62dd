"""`python -m pdraft ...`: the same command as the `pdraft` console script, so that
`torchrun --nproc_per_node N -m pdraft train RECIPE` starts one pdraft process per GPU (or CPU slot)."""

from pdraft.cli.main import run

if __name__ == "__main__":
    run()
