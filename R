Traceback (most recent call last):
  File "/work/main/benchmarks/redistribute.py", line 41, in <module>
    import numpy as np
ModuleNotFoundError: No module named 'numpy'
--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
Traceback (most recent call last):
  File "/work/main/benchmarks/redistribute.py", line 41, in <module>
    import numpy as np
ModuleNotFoundError: No module named 'numpy'
--------------------------------------------------------------------------
mpiexec detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[32518,1],0]
  Exit code:    1
--------------------------------------------------------------------------
