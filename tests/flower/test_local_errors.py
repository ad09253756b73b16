"""A failed `flwr run` leads with the ServerApp's own fedcache error, not flwr's streamed traceback."""

from fedcache.flower.local import _server_error

STREAM = """Successfully started run 1
ERROR :     ServerApp raised an exception
Traceback (most recent call last):
  File "server.py", line 133, in wait_for_clients
fedcache.flower.server.TooFewClientsError: only 2 of 3 clients connected (deploy.min_clients=3); missing clients [1]
ERROR :     Exit Code: 201
"""


def test_server_error_is_the_fedcache_exception_line():
    assert _server_error(STREAM) == ("only 2 of 3 clients connected (deploy.min_clients=3); missing clients [1]\n\n")


def test_no_fedcache_error_adds_nothing():
    assert _server_error("Traceback\nValueError: boom\n") == ""
