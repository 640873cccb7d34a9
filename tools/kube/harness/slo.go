package main

func mainSLO(args []string) int { return 2 }
