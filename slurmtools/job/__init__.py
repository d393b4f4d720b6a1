"""The job's author's side, on the user's machine or a login node: the sbatch script (sbatch.py),
submitting and watching a job (submit.py), and the notebook path through submitit (notebook.py,
notebook_view.py, and task_start.py, the first code of every submitit task). It sits on top: it may
import the spec, the supervisor's flags, the reference trainer, the report and everything below."""
