import sys

from engines.voice_host.server import main

sys.exit(main())
