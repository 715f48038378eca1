"""The many-hosts test bed: network namespaces as hosts, faults as functions (see bed.py)."""

from tests.netbed.bed import HOSTS, Bed, BedError, remove_all

__all__ = ["HOSTS", "Bed", "BedError", "remove_all"]
