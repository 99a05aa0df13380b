"""The one-line command-line parser every `python -m labsupport <command>` uses.

A bad flag is one line on stderr and exit code 2, never argparse's whole usage block or a traceback.
"""
from __future__ import annotations

import argparse


class UsageError(Exception):
    """A command-line flag was wrong; the message is the one line to print."""


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)
