"""What a declared model's label request weighs and what reading it costs the learner, with
its inputs written as the entries the event sets beside its fields, and as a worker writes
it now (its fields alone, which the learner encodes), for ``loadtest/wide.py``'s events; no
Kafka.

    python loadtest/request_size.py [SHAPE ...]

Per shape, the request carrying the moments of the last event (every event asked) and of the
last 20 (a 5 % budget): the median bytes of 160 requests each way, and the median CPU time
of reading one and making the inputs it teaches (``inputs_of``).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from label_cost import moments_of, request_of  # noqa: E402
from wide import config_of, events, vector  # noqa: E402

from service.features import encoder_of  # noqa: E402
from service.records import parse_label_request  # noqa: E402
from service.records.codec import numbers_of  # noqa: E402
from service.stream.labels.admission import inputs_of  # noqa: E402


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
            carried, alone, read_carried, read_alone = [], [], [], []
            for i in range(40, 200):
                request = dataclasses.replace(
                    request_of(i, X[i], 3, moments_of(X[i - between + 1 : i + 1, :width])),
                    features=None,
                    fields=shown(stream[i][0]),
                )
                with_inputs = dataclasses.replace(request, features=numbers_of(X[i]))
                old, new = with_inputs.to_json(), request.to_json()
                carried.append(len(old))
                alone.append(len(new))
                for raw, times in ((old, read_carried), (new, read_alone)):
                    tic = time.process_time()
                    x = inputs_of(parse_label_request(raw), config)
                    times.append(time.process_time() - tic)
                    assert x.tolist() == X[i].tolist()  # noqa: S101 - the same inputs
            m = statistics.median
            print(
                f"{shape:>13}, moments of {between:2d}: {m(carried) / 1024:6.1f} -> "
                f"{m(alone) / 1024:5.1f} KiB ({m(alone) / m(carried):.2f}x); read and "
                f"inputs made {m(read_carried) * 1e6:5.0f} -> {m(read_alone) * 1e6:5.0f} us"
            )


if __name__ == "__main__":
    main()
