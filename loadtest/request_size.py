"""What a declared model's label request weighs and what reading one costs, written whole
(every list of the model's width) and as the learner now writes it (the inputs that are not
zero), for ``loadtest/wide.py``'s events; no Kafka.

    python loadtest/request_size.py [SHAPE ...]

Per shape, the request carrying the moments of the last event (every event asked) and of the
last 20 (a 5 % budget), as a worker writes it (its ``fields`` included): the median bytes of
160 requests each way and the median CPU time of reading one.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from label_cost import moments_of, request_of  # noqa: E402
from wide import config_of, events, vector  # noqa: E402

from service.features import encoder_of  # noqa: E402
from service.records import parse_label_request  # noqa: E402
from service.records.codec import numbers_of  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    default = ["hashed8-30", "hashed9-300", "hashed10-300", "hashed12-30", "hashed12-300"]
    p.add_argument("shapes", nargs="*", default=default)
    args = p.parse_args()
    for shape in args.shapes:
        config = config_of(shape)
        assert config.fields is not None  # noqa: S101 - the declared shapes
        stream = events(shape, 200, np.random.default_rng(1))
        X = np.vstack([vector(config, f) for f, _ in stream])
        shown = encoder_of(config.fields).shown
        width = config.moments_inputs  # the moments a scorer gathers: the numbers'
        for between in (1, 20):
            whole, written, read_whole, read_written = [], [], [], []
            for i in range(40, 200):
                request = dataclasses.replace(
                    request_of(i, X[i], 3, moments_of(X[i - between + 1 : i + 1, :width])),
                    features=numbers_of(X[i]),
                    fields=shown(stream[i][0]),
                )
                old, new = orjson.dumps(request), request.to_json()  # every list whole; now
                whole.append(len(old))
                written.append(len(new))
                for raw, times in ((old, read_whole), (new, read_written)):
                    tic = time.process_time()
                    parse_label_request(raw)
                    times.append(time.process_time() - tic)
            m = statistics.median
            print(
                f"{shape:>13}, moments of {between:2d}: {m(whole) / 1024:6.1f} -> "
                f"{m(written) / 1024:5.1f} KiB ({m(written) / m(whole):.2f}x); read "
                f"{m(read_whole) * 1e6:5.0f} -> {m(read_written) * 1e6:5.0f} us"
            )


if __name__ == "__main__":
    main()
