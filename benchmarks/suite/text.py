"""From raw text (:mod:`datamask_dask.text`): the packaged embedding model and the heuristic quality
scorer on documents long enough to fill a window of 128 tokens. Skipped without the text extra."""

from __future__ import annotations

import time

PARAGRAPH = ("The history of the city begins in the twelfth century, when a small group of merchants "
             "settled on the bank of the river. Over the following decades they built a market, a church "
             "and a bridge, and the town grew into one of the most important trading centres of the region. ")


class Text:
    timeout = 300
    timer = staticmethod(time.process_time)  # CPU seconds: other processes on a shared machine do not count

    def setup(self):
        try:
            from datamask_dask.text.embedding import encode, get_model
        except ImportError as error:
            raise NotImplementedError(f"no text extra: {error}") from error
        try:
            get_model(device="cpu")
        except (ImportError, OSError) as error:
            raise NotImplementedError(f"no embedding model: {error}") from error
        import torch

        torch.set_num_threads(1)  # as in a job's worker: CPU seconds count work, not spinning threads
        self.texts = [f"Document {i}. " + PARAGRAPH * 12 for i in range(64)]  # > 128 tokens each
        self.encode = encode
        for precision in ("float32", "bfloat16"):  # weights loaded before the timed runs
            encode(self.texts[:8], device="cpu", max_tokens=128, precision=precision)

    def time_embed_64_documents(self):
        self.encode(self.texts, device="cpu", max_tokens=128, batch_size=32, precision="float32")

    def time_embed_64_documents_bfloat16(self):
        self.encode(self.texts, device="cpu", max_tokens=128, batch_size=32, precision="bfloat16")

    def time_heuristic_scores_3200_documents(self):
        from datamask_dask.text.quality import heuristic_scores

        heuristic_scores(self.texts * 50)
