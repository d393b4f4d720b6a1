"""Node health: probes gather facts (NVML, sysfs, psutil, kernel log), pure checks judge them,
the runner time-boxes the probes, the gate drains with a reason we own."""
