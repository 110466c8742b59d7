module idemhttp

go 1.19
