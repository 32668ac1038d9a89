"""The process-count rule, written once (RunConfig.processes): workers x the tensor-parallel size P,
plus one process for a server."""

import re
from pathlib import Path

import gradwire
from gradwire.config import RunConfig


def test_workers_times_p_plus_a_server():
    assert RunConfig(workers=3).processes(server=False) == 3
    assert RunConfig(workers=3).processes(server=True) == 4
    assert RunConfig(workers=3, tensor_parallel="1d:p=2").processes(server=False) == 6
    assert RunConfig(workers=2, tensor_parallel="2.5d:q=2,d=2").processes(server=False) == 16
    assert RunConfig(workers=2, tensor_parallel="2d:q=2").tensor_parallel_size() == 4


def test_read_backwards_it_gives_the_workers_and_what_is_left():
    for cfg in (RunConfig(workers=3), RunConfig(workers=3, tensor_parallel="1d:p=2"),
                RunConfig(workers=2, tensor_parallel="2.5d:q=2,d=2")):
        for server in (False, True):
            assert cfg.workers_for(cfg.processes(server), server) == (cfg.workers, 0)
    assert RunConfig(tensor_parallel="1d:p=2").workers_for(7, server=False) == (3, 1)
    assert RunConfig().workers_for(5, server=True) == (4, 0)


def test_the_rule_is_written_nowhere_else():
    src = Path(gradwire.__file__).parent
    rule = re.compile(r"workers \+ int\(|workers \* .*\.size\b|workers \+ server\b|world_size - int\(server")
    offenders = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py") if p.name != "config.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if rule.search(line)]
    assert offenders == []
