"""Helpers shared by the tests (not test modules): builders, fakes and subprocess workers."""
