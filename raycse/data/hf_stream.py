"""A streamed Hugging Face dataset (``datasets.IterableDataset``) as a Ray Datasource.

On Ray Data's public Datasource interface, as Ray's own (internal) one for it works: one read task that
iterates the stream in Arrow batches, so a corpus larger than memory is never held whole.
"""

from __future__ import annotations

from ray.data import Datasource, ReadTask
from ray.data.block import BlockMetadata


class StreamedHFDatasource(Datasource):
    def __init__(self, hf, batch_size: int = 4096):
        self.hf, self.batch_size = hf, batch_size

    def estimate_inmemory_data_size(self):
        return None  # (a stream: unknown until read)

    def get_read_tasks(self, parallelism: int, **kwargs) -> list:
        hf, size = self.hf, self.batch_size

        def read():
            yield from hf.with_format("arrow").iter(batch_size=size)

        return [ReadTask(read, BlockMetadata(num_rows=None, size_bytes=None, input_files=None, exec_stats=None))]
