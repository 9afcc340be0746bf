"""Code that runs ON a worker host, inside the backend's venv.

Shipped alone to TPU hosts, so it imports nothing from the controller's side (``cli``, ``ops``,
``providers``, ``fleet``, ``readers``): only the layers below it (``tpuft.core``, ``tpuft.run``,
``tpuft.storage``, ``tpuft.config``, the shared ``tpuft.data``, ``tpuft.scoring`` and ``tpuft.host``), the
backends' schemas, ``tpuft.model``, ``tpuft.convert``, the stdlib and the backend's own libraries.
``tests/test_layering.py`` checks it against the layers of ``tests/layers.py``.
"""
