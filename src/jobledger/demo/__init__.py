"""The demo behind ``jobledger demo``: a mission that shows every capability at once.

``mission.yaml`` is the workflow definition (also ``examples/definitions/
demo_mission.v1.yaml``), ``field_notes.txt`` the text the demo's agent works on.
"""

from __future__ import annotations

from importlib.resources import files

MISSION_RESOURCE = "mission.yaml"
FAN_OUT_RESOURCES = ("fan_out.yaml", "paragraph.yaml")
TEXT_RESOURCE = "field_notes.txt"


def mission_document() -> str:
    return files(__package__).joinpath(MISSION_RESOURCE).read_text(encoding="utf-8")


def fan_out_documents() -> list[tuple[str, str]]:
    """(file name, text) of the fan-out mission and its child workflow."""
    folder = files(__package__)
    return [(name, folder.joinpath(name).read_text(encoding="utf-8")) for name in FAN_OUT_RESOURCES]


def field_notes() -> str:
    return files(__package__).joinpath(TEXT_RESOURCE).read_text(encoding="utf-8")
