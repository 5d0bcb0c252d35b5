"""A text env written the way an outside author would: plain Gymnasium, no capo import (tests/test_plain_env.py)."""
