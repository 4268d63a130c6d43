"""The label desk (``abstain desk``): a web work queue for the people who answer label
requests (docs/operate/desk.md).

- :mod:`.backlog`: open requests in urgency order, fed by the label-requests and labels
  topics and the learner's pending changelog; what the team view counts;
- :mod:`.leases`: who holds which request, decided by the order of the leases topic;
- :mod:`.core`: take the next request, renew, answer (saved once Kafka acknowledged), skip;
- :mod:`.auth`: people, scrypt hashes checked off the loop and throttled, signed session
  cookies and CSRF tokens, logouts, trusted proxies;
- :mod:`.feeds`: the Kafka reader and writers; :mod:`.web`, :mod:`.pages`: the HTTP side;
- :mod:`.metrics`: the ``abstain_desk_*`` series; :mod:`.cli`: ``abstain desk``.

Errors::

    AbstainError
     └── DeskError
          ├── AccountsError (ValueError) the users file cannot be used
          ├── Refused       an action refused: .status (HTTP), .code, the reason
          └── Unavailable   Kafka did not acknowledge in time: nothing saved
"""

from service.desk.errors import AccountsError, DeskError, Refused, Unavailable

__all__ = ["AccountsError", "DeskError", "Refused", "Unavailable"]
