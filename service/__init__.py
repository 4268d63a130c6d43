"""abstain: score event streams with a reject-option classifier that learns online from the
few labels it asks for."""

__version__ = "0.2.0"
