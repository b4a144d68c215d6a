"""Forward stage: the API shape (``endpoints``: chat, completions, ``responses``) and its ``body``, the hold on a
worker with retries before the first byte (``client``), and the relay of its answer (``relay``, ``sse``)."""
