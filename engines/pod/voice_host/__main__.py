import sys

from engines.pod.voice_host.server import main

sys.exit(main())
