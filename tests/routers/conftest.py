"""The router suite (issue 36): `pagoda serve` replicas behind real routers, on 127.0.0.1."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
