"""The worker process: fires each request on time over keep-alive HTTP and times its stream by the kernel."""
