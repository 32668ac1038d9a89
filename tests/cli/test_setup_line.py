"""The set-up line `gradwire run` prints after a run: an algorithm's choices in words and numbers,
never a Python dict's repr (PowerSGD's nested choices printed as {'compressed': {'0': 2, ...}})."""

from gradwire.cli.run import describe_setup


def test_nested_choices_read_as_text():
    info = {"powersgd": {"compressed": {"0": 2, "2": 2}, "uncompressed": ["1", "3"], "bytes_per_worker_step": 1912}}
    assert describe_setup("sync", info, 4) == ("sync set-up: powersgd: compressed 0=2 2=2; uncompressed 1, 3; "
                                               "bytes_per_worker_step 1912")


def test_scalars_and_per_worker_lists():
    info = {"mode": "relative", "budget": 0.02, "keep": [97, 98]}
    assert describe_setup("dagc", info, 2).splitlines() == [
        "dagc set-up: mode=relative, budget=0.02", "  worker         keep", "       0           97",
        "       1           98"]
