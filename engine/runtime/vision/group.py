"""A vision model split over a group: its ranks serve the text; the vision tower's features
don't yet enter the sharded language model's first stage, so a request with images gets a
400 that says so (not that the model reads text only)."""

from __future__ import annotations

from engine.errors import BadRequest
from engine.protocol import GenerateRequest


def refuse_images_in_group(request: GenerateRequest) -> None:
    """Raise the 400 for a request with images to a vision model served by a group."""
    if request.images or any(p.get("type") == "image" for m in request.messages or ()
                             for p in m.get("parts") or ()):
        raise BadRequest("Images need this model on one node: here it is split over a group "
                         "of machines, which serves its text only. Send the request without "
                         "images, or load the model on a node that holds it whole.",
                         param="messages", code="images_unsupported")
