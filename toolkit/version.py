"""The toolkit's version, bumped per release (CHANGELOG.md names what each version changed)."""

__version__ = "2.9.2"
