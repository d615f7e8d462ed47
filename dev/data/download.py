"""
Downloads for the dataset scripts that need the internet (tinyshakespeare,
hellaswag, fineweb).

Why a module: an offline machine must get one clear line saying what could not
be reached and what to use instead, never a urllib traceback; and an
interrupted download must never leave a truncated file that a later run takes
for complete. So a download goes to a temp file that is renamed when done, and
one that fails removes the folders it made for the file (a later listing would
show an empty dataset folder as one prepared).
Only the standard library is used (urllib), so nothing beyond numpy and
tiktoken has to be installed for these scripts.
"""

import os
import shutil
import sys
import urllib.error
import urllib.request

TIMEOUT_SECONDS = 30
OFFLINE_HINT = "without internet, build the offline corpus: python3 dev/data/offline_corpus.py"


def die_unreachable(url, reason, offline_hint=OFFLINE_HINT):
    print(f"error: cannot reach {url} ({reason}); this script needs the internet; {offline_hint}", file=sys.stderr)
    sys.exit(1)


def make_folders(folder):
    """os.makedirs(folder); returns the folders it made, deepest first"""
    made = []
    probe = os.path.abspath(folder)
    while not os.path.isdir(probe):
        made.append(probe)
        probe = os.path.dirname(probe)
    os.makedirs(folder, exist_ok=True)
    return made


def download_file(url, path, offline_hint=OFFLINE_HINT):
    """Downloads url to path unless path exists; exits 1 with one line if the url is unreachable, ending with
    offline_hint (what to do instead without internet)."""
    if os.path.exists(path):
        print(f"{path} already exists, not downloading")
        return
    made = make_folders(os.path.dirname(path) or ".")
    temp_path = path + ".part"
    print(f"downloading {url} to {path}")
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response, open(temp_path, "wb") as f:
            shutil.copyfileobj(response, f)
    except (urllib.error.URLError, OSError, ValueError) as e:
        if os.path.exists(temp_path):
            os.remove(temp_path)
        for folder in made:
            if not os.listdir(folder):
                os.rmdir(folder)
        die_unreachable(url, getattr(e, "reason", None) or e, offline_hint)
    os.replace(temp_path, path)


def check_reachable(url):
    """Exits 1 with one line unless an HTTP(S) request to url gets any answer at all."""
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=TIMEOUT_SECONDS).close()
    except urllib.error.HTTPError:
        return  # the server answered (even 4xx): the network is there
    except (urllib.error.URLError, OSError, ValueError) as e:
        die_unreachable(url, getattr(e, "reason", None) or e)
