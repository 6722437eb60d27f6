"""Azure responses shaped like the real ones (resource_skus REST JSON, Retail Prices API pages).

What real answers contain: sizes named ``Standard_...``; H100/A100 sizes and a GPU size of a
family we do not know; a size restricted for this subscription; Windows meters spelled both
"... Series Windows" and "NCCadsv5 Srs Win"; Cloud Services rows; Low Priority and zero-price
meters; spot meters named "<size> Spot"; two pages joined by ``NextPageLink``.
"""

from __future__ import annotations

from typing import Any


def _sku(name: str, gpus: str | None, zones: list[str], restricted: bool = False) -> dict[str, Any]:
    caps = [{"name": "vCPUs", "value": "6"}] + ([{"name": "GPUs", "value": gpus}] if gpus is not None else [])
    return {"resourceType": "virtualMachines", "name": name, "tier": "Standard", "size": name.removeprefix("Standard_"),
            "family": "standardFamily", "locations": ["eastus"], "locationInfo": [{"location": "eastus", "zones": zones}],
            "capabilities": caps,
            "restrictions": [{"type": "Location", "values": ["eastus"], "reasonCode": "NotAvailableForSubscription"}]
            if restricted else []}


RESOURCE_SKUS = {"value": [
    _sku("Standard_NC6s_v3", "1", ["2", "1"]),
    _sku("Standard_NC24s_v3", "4", [], restricted=True),
    _sku("Standard_NC24ads_A100_v4", "1", ["1", "2", "3"]),
    _sku("Standard_ND96isr_H100_v5", "8", ["1"]),
    _sku("Standard_NC16as_T4_v3", "1", []),
    _sku("Standard_NX12s_v9", "2", []),  # a GPU family we cannot read: reported, not guessed
    _sku("Standard_NV6ads_A10_v5", "1", ["1"]),  # 1/6 of an A10 although the capability says 1 GPU
    _sku("Standard_NV36ads_A10_v5", "1", ["1"]),  # one whole A10
    _sku("Standard_D2s_v3", None, ["1"]),
]}


def meter(size: str, meter_name: str, price: Any, product: str, region: str = "eastus") -> dict[str, Any]:
    return {"currencyCode": "USD", "tierMinimumUnits": 0.0, "retailPrice": price, "unitPrice": price,
            "armRegionName": region, "location": "US East", "effectiveStartDate": "2026-10-01T00:00:00Z",
            "meterId": "00000000", "meterName": meter_name, "productId": "DZH318Z0BQ4L", "skuId": "DZH318Z0BQ4L/00",
            "productName": product, "skuName": meter_name, "serviceName": "Virtual Machines", "serviceId": "DZH313Z7MMC8",
            "serviceFamily": "Compute", "unitOfMeasure": "1 Hour", "type": "Consumption", "isPrimaryMeterRegion": True,
            "armSkuName": size}


PAGE1 = [
    meter("Standard_NC6s_v3", "NC6s v3", 3.06, "Virtual Machines NCSv3 Series"),
    meter("Standard_NC6s_v3", "NC6s v3 Low Priority", 0.612, "Virtual Machines NCSv3 Series"),
    meter("Standard_NC6s_v3", "NC6s v3", 3.68, "Virtual Machines NCSv3 Series Windows"),
    meter("Standard_NC24ads_A100_v4", "NC24ads A100 v4", 3.673, "Virtual Machines NCads A100 v4 Series"),
    meter("Standard_NC24ads_A100_v4", "NC24ads A100 v4", 4.5, "Virtual Machines NCCadsv5 Srs Win"),
    meter("Standard_NC6s_v3", "NC6s v3", 3.30, "Cloud Services NCSv3 Series"),
    meter("Standard_NC16as_T4_v3", "NC16as T4 v3", 0.0, "Virtual Machines NCasT4 v3 Series"),
    meter("Standard_D2s_v3", "D2s v3", 0.096, "Virtual Machines Dsv3 Series"),
]
PAGE2 = [
    meter("Standard_NC6s_v3", "NC6s v3 Spot", 0.3052, "Virtual Machines NCSv3 Series"),
    meter("Standard_NC24s_v3", "NC24s v3", 12.24, "Virtual Machines NCSv3 Series"),
    meter("Standard_ND96isr_H100_v5", "ND96isr H100 v5", 98.32, "Virtual Machines NDsH100v5 Series"),
    meter("Standard_ND96isr_H100_v5", "ND96isr H100 v5 Spot", 39.33, "Virtual Machines NDsH100v5 Series"),
    meter("Standard_NX12s_v9", "NX12s v9", 7.0, "Virtual Machines NXv9 Series"),
    meter("Standard_NV6ads_A10_v5", "NV6ads A10 v5", 0.454, "Virtual Machines NVadsA10 v5 Series"),
    meter("Standard_NV36ads_A10_v5", "NV36ads A10 v5", 3.20, "Virtual Machines NVadsA10 v5 Series"),
]


def pages(base_url: str) -> list[dict[str, Any]]:
    return [{"BillingCurrency": "USD", "CustomerEntityId": "Default", "CustomerEntityType": "Retail", "Items": PAGE1,
             "NextPageLink": f"{base_url}/api/retail/prices?$filter=x&$skip=100", "Count": len(PAGE1)},
            {"BillingCurrency": "USD", "Items": PAGE2, "NextPageLink": None, "Count": len(PAGE2)}]
