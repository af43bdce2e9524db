"""Fixes: swapping a decided set of modules, intercepting functional calls, rewriting model YAMLs."""
