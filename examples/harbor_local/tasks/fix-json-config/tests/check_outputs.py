import json
import sys

data = json.load(open("/app/settings.json"))
sys.exit(0 if data == {"name": "harbor-demo", "port": 8080, "debug": False, "tags": ["a", "b"]} else 1)
