"""Names of the runtime/driver calls that launch kernels, replay graphs, or make the host wait."""

from __future__ import annotations

# CUDA and AMD's HIP (ROCm torch traces name the HIP calls; their categories are the same).
LAUNCH_APIS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
               "cudaLaunchCooperativeKernel", "cuLaunchCooperativeKernel",
               "hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel",
               "hipExtLaunchKernel", "hipLaunchCooperativeKernel")
GRAPH_LAUNCH_APIS = ("cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch")
SYNC_APIS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
             "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cudaStreamWaitEvent",
             "cuStreamWaitEvent",
             "hipDeviceSynchronize", "hipStreamSynchronize", "hipEventSynchronize", "hipStreamWaitEvent",
             "hipCtxSynchronize")
