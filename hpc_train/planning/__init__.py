"""Planning, pure: checkpoint cost (``costs``) and the save interval, ETTR and price per node
count (``plan``, Young/Daly; ``hpc-train plan``)."""
