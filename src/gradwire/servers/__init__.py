"""Drivers: how a run's steps are driven (``driver.py``: the ``Driver`` interface, ``DriverParts``
and the collective driver), and the server-mode drivers that run the protocol of an algorithm that
has a server (``algorithms/protocol.py``) on the simulator (``simulated.py``) or on a real backend
(``real.py``, over ``inbox.py``). No driver knows which algorithm it runs; ``run/drivers.py``
chooses and builds one."""
