"""The model of the run: calibrated on one measured vLLM run (its benchmark, log, metrics, steps and the model's
shape), it predicts request throughput, output throughput, mean TTFT and mean TPOT under other flag values, each
with a range and the reasoning in words (`predict.predict`). It sits between the analyses it reads and the
diagnosis that uses it: rules say which levers apply, the model chooses their values and their order."""
