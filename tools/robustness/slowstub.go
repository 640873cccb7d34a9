package main

func cmdHA(args []string) int          { return 2 }
func cmdSlowReaders(args []string) int { return 2 }
