"""Server-mode drivers: they run the protocol of an algorithm that has a server
(``algorithms/protocol.py``) on the simulator (``simulated.py``) or on a real backend
(``real.py``, over ``inbox.py``). No driver knows which algorithm it runs."""
