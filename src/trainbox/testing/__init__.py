"""Fault injection for tests: inert unless TRAINBOX_FAULT asks for a fault."""
