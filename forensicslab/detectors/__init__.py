"""The detector pool: tool cards, the registry (built-ins, entry-point plug-ins, remote servers), Stage 0 dispatch, panels.

Third-party detectors register with `from forensicslab.detectors import register`."""
from .pool import (discover, get_card, get_detector, list_detectors, load_card, make_detection, register, run_pool,
                   unregister)
from .remote import REMOTE_ENV, RemoteDetector, register_remote
