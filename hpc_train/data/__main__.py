import sys

from hpc_train.data.command import main

sys.exit(main())
