"""``one_thread``: the tests of a module, or of a folder, on one intra-op thread.

The fixture is autouse, so it applies where it is imported: a test module, or a folder's conftest.py
(``from tests.helpers.threads import one_thread  # noqa: F401``). The root conftest does not import it,
which would put every test on one thread, the op tests of the kernels' threading included.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread for each test module where it applies, its module-scoped fixtures included
    (restored after the module): tiny models run fastest on one thread, and most reproducibly on a busy
    machine, free of oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
