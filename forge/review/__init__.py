"""Reviewing what a search did and what it cost: terminal views, reports (terminal, HTML, JSON), web UI.

- `data`: runs, tasks, trees and nodes gathered from the store into frozen views (no SQL here);
- `tree`: `forge runs`, `forge tree`, `forge show` in the terminal (rich);
- `report`: `forge report` (terminal, JSON) and the self-contained HTML report;
- `html`, `svg`: escaped HTML fragments and inline SVG charts shared by the report and the web UI;
- `web`: `forge ui`, a read-only FastAPI app (needs the `ui` extra).

Important: candidate sources, logs, LLM text and task keys are untrusted; every renderer escapes them.
"""
