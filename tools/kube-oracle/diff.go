package main

func diffCmd(args []string) int { return 2 }
