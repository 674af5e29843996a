"""Presentation helpers for the book's notebooks: tables, frame grids, inline video."""
