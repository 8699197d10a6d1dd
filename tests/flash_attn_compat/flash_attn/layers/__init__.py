"""flash-attn's ``layers`` names that its tests import (rotary embedding)."""
