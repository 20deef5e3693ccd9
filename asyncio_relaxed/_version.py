"""The package's version, read by hatchling for the metadata and by the loop
for its startup line and published snapshots."""

__version__ = "0.2.0"
