// placeholder so the module links before its code lands
