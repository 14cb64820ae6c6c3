"""Test helpers shared by several test folders (local servers, builders)."""
