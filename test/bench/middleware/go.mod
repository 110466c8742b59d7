module loadgen

go 1.19
