"""What embeds posts for a corpus: ``EmbedPosts``, the one signature of the candidate tower in
this process (``phoenix.engine.CandidateTower``) and the server's
(``phoenix.client.served_tower``), ``embed(post_ids [n], author_ids [n], progress=None) ->
float32 [n, D]`` (``progress`` is called with the posts just embedded), so that building a
store, ingesting into one and writing a corpus file do not care where the tower runs.
``emb_size`` is the tower's width when it is known before it has answered (in process), else
None.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional, Protocol

import numpy as np

Progress = Callable[[int], object]  # its answer is ignored (tqdm.update returns one)


class EmbedPosts(Protocol):
    emb_size: Optional[int]

    def __call__(
        self, post_ids: np.ndarray, author_ids: np.ndarray, progress: Optional[Progress] = None
    ) -> np.ndarray: ...
