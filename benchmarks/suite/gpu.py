"""The learner on a CUDA device: ``learn_mask`` with the gpu profile on one chunk
(``data.SHAPES["LearnMaskGPU"]``), and its selection's share of the baseline's gain. Skipped without a
CUDA GPU."""

from __future__ import annotations

from . import data

METRICS = ["Pair_simi", "Facility"]
SHAPE = data.SHAPES["LearnMaskGPU"]


class LearnMaskGPU:
    params = (METRICS,)
    param_names = ["metric"]
    timeout = 600

    def setup(self, metric):
        import torch

        if not torch.cuda.is_available():
            raise NotImplementedError("no CUDA GPU")
        from datamask_dask.config import resolve_options

        self.quality, self.emb = data.embeddings(SHAPE["rows"], SHAPE["dim"], SHAPE["clusters"])
        self.options = resolve_options("gpu", algorithm=metric).learner
        self.run()  # kernels and the CUDA context loaded before the timed runs

    def run(self):
        import torch

        from datamask_dask import learn_mask

        result = learn_mask(self.quality, self.emb, SHAPE["k"], self.options, device="cuda")
        torch.cuda.synchronize()
        return result

    def time_learn_mask(self, metric):
        self.run()

    def track_gpu_peak_mib(self, metric):
        import torch

        torch.cuda.reset_peak_memory_stats()
        self.run()
        return torch.cuda.max_memory_allocated() / 2**20

    track_gpu_peak_mib.unit = "MiB"

    def track_share(self, metric):
        from datamask_dask.learn.yardstick import measure

        mask = self.run().mask
        return 100 * measure(self.quality, self.emb, mask, algorithm=metric,
                             lamb=self.options.lamb).share

    track_share.unit = "points"
